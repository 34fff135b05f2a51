"""The replay queue: who may catch up now, who waits, in which order, and who is paused so that
live versions keep up (docs/budget.md).

Its modules say what they hold, from the pure rules up:

- ``order``: priorities and the queue's ETAs (pure);
- ``live_first``: when live versions are too far behind, and which catch-up to pause (pure);
- ``queries``: the catalog's queue, slot holders, hold and keepers (SQL);
- ``launching``: an attempt claimed and its driver launched;
- ``slots``: a version started or queued, the queue's slots handed out, dead holders requeued;
- ``pausing``: live first's hold renewed, and a catch-up paused back into the queue;
- ``keeper``: the loop that hands out slots when nobody waits (`kappa queue keep`);
- ``desk``: the facade's part (`kappa queue`).

Layers (pyproject.toml's import contracts): ``order`` and ``live_first`` are domain,
``queries`` an adapter beside the catalog, the rest actions beside ``versions``.
"""

"""The `kappa` command line: parse, call one facade method, print (rich, or --json)."""

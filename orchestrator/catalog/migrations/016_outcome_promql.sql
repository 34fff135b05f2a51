-- PromQL outcome metrics read three cumulative figures per serving version: the sum of the
-- values (query_promql), their number, and for a mean the sum of their squares.
ALTER TABLE outcome_metrics
    ADD COLUMN query_promql_count text,
    ADD COLUMN query_promql_squares text;

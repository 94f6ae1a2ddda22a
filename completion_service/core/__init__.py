"""The completion authority's pure core: gates, decisions, identity, duplicate
policy, run rules and the transcript grammar. Plain values in, values out; no I/O."""

"""The lifecycle authority's pure core: plain values in, a decision out. No I/O."""

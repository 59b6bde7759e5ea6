"""Statistics of measurements: latency statistics as trtexec computes them, confidence intervals, comparisons of
figures measured apart and of paired A/B windows."""

"""The CPU testbed: calibration of this CPU machine, runner-plan prediction with CPU time sharing, probes and
the predicted-vs-observed validation. It models CPU time sharing and does not transfer to GPUs; everything it
prints says "CPU testbed". The runtime never imports it."""

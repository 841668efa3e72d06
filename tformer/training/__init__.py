"""Training: ``run.train()`` sets a run up (configs, inputs, launch) and the loop runs it, with
its parts (state, signals, faults, reporting, saving, best) one module each."""

"""Third-party tools driven by the workbench's engines: ``lm_eval`` (lm-evaluation-harness's
model "workbench"). Each is imported on its own, with its tool installed."""

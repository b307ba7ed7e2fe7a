"""One way in: run options resolved into one frozen Run (configs, sizes, the user's module, a model's layer)."""

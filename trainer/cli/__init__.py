"""The flags door: command-line flags and config files generated from TrainConfig and task signatures."""

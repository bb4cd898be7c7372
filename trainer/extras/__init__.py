"""Extras the core never imports: EMA, loggers, the batch-size search (callbacks or callables)."""

"""The sweep: CLI, spec, Optuna study, backends (Ray), MLflow tracking. Never imports torch."""

"""The catalog: what is trained (models, from Hugging Face config.json files in hf_configs/), on what (GPUs, from
their datasheets) and with which software (container releases and their maturity on each GPU)."""

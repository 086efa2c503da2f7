"""The real Megatron-Core long-context MoE trainer. Importing this package does not import torch."""

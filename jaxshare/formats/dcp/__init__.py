"""PyTorch DCP folders (``torch.distributed.checkpoint``), read and written without torch."""

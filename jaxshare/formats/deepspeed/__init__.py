"""DeepSpeed ZeRO folders, read without deepspeed or torch: the weights and the optimizer state."""

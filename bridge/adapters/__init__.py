"""Adapters: PEFT LoRA adapter directories read and written (:mod:`bridge.adapters.peft`),
and merged into their base one tensor at a time (:mod:`bridge.adapters.lora`).
"""

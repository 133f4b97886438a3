"""Model families: each one's vocabulary in one pure room (no I/O, no imports from the rest of shardport).

A family's room holds what every layer must agree on about its checkpoints: the operator slots of a
layer, the tensor names in each naming scheme (Hugging Face, GGUF), the tensor-parallel split rule of
each operator, and the spellings of its parameters (config.json keys, GGUF metadata keys). The
registry binds and checks weights with it, placement splits with it, the runtime graph reads weights
by it; none of them keeps its own copy (``tests/test_llama_room.py``).

* :mod:`.llama`: llama, mistral, qwen2 and mixtral (dense and MoE).
"""

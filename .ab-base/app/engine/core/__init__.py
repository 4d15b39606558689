"""The engine core: `LLMEngine` (schedule -> run -> postprocess), its thread-owning client, the scheduler,
output processing and the MoE expert residency (the memory plan is app/engine/plan/)."""

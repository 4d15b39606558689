"""The engine core: `LLMEngine` (schedule -> run -> postprocess), its thread-owning client, the scheduler,
output processing and the memory plan."""

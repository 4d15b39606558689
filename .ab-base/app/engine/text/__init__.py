"""Text in and out of the model: chat templates and tool-call parsing."""

"""Work that is not text generation: pooling (embeddings from the loaded model), reranking, transcription."""

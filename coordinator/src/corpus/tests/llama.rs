//! Corpus tests on the generated `tiny` GGUF model (added when the generator lands).

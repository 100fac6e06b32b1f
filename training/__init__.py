"""regis training: fine-tuning encoders (multi-vector triplet recipe, DMCAC) and retrieval evaluation."""

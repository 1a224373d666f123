"""The Ray-free training layer below the algorithms: a client's runtime (its data, resident
models and the shared local training loop), weights as numpy dicts, the vectorised path,
evaluation metrics and membership scoring. Nothing here imports Ray or the engine."""

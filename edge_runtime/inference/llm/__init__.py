"""The llama.cpp language model, in layers (each imports only the ones below it):

- `handles`: one owning wrapper per raw llama.cpp handle (model, context, batch, sampler), each
  with an idempotent `close()`, so constructors can hand them to an `ExitStack`; `runtime`: the library
  as a whole (its log, buffer types, build);
- `constraint`: llguidance (the GGUF vocabulary as its tokenizer, GBNF -> Lark, matchers);
- `picker`: each next token (grammar, then greedy or sampled; UTF-8 guard);
- `feed`: prompt pieces -> batches -> `llama_decode` (tokens and image embeddings);
- `sequence`: one prompt of the parallel sequences and its state while it runs;
- `speculate`, `parallel_context`: a lone sequence's step with the draft's guesses; the second context;
- `parallel`: several prompts as parallel sequences of one batch, on a second context;
- `model`: `LanguageModel`, the model with its prefix cache; `edge_runtime.inference.llm` re-exports it.
"""

"""The offline pipeline that turns a GGUF into a Kairox GGUF, and checks the result.

Order of use: :mod:`.profile` records FFN activations on text (:mod:`.corpus`, optionally
mixed with the model's own answers, :mod:`.selftext`); :mod:`.convert` trains the activation
predictors (:mod:`.predictor`), groups co-activating neurons (:mod:`.grouping`), rewrites
``ffn_down`` transposed in any weight type (:mod:`.quant`) and writes the file, with per-layer
reports (:mod:`.report`). :mod:`.calibrate` then measures this machine's sparse/dense
crossover into the file, and :mod:`.evaluate` measures perplexity. :mod:`.hf_opt` brings a
Hugging Face OPT checkpoint in as a GGUF the pipeline can start from.
"""

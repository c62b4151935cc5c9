"""The numeric engine, numpy only: model specs (``specs``), the language model (``model``, with
its input ``embedding`` and output ``head``), the loss table (``losses``), AdamW (``optim``),
sampling (``sampling``) and the PEFT file format (``peft``). Imports nothing else of
``mock_server``."""

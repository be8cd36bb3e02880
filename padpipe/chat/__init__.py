"""The chat wing: a ``transformers`` tokenizer's chat template rendered as ``apply_chat_template`` renders it
(template), what a probe conversation shows of it: its prompt and how turns end (probe), the stage's options
(options), the columns of a conversation row read into Python values (rows), the rows a conversation becomes
(conversation), each trained message's span in the rendered text (spans, locate), the tokens with their
character spans (encode), the labels cut to ``max_length`` (labels) and what a batch became (outcome).

``.chat()`` (``padpipe/pipes/chat.py``) is its only user. Modules here carry plain names; the wing is
private as a whole (the public face is ``padpipe/__init__.py``).
"""

"""The chat wing: a chat template rendered as ``apply_chat_template`` renders it (template, probe), the stage's
options (options), a conversation row's columns read (rows), planned as rows (plan, conversation) with each
trained message's span (spans, locate), what is refused and how it is said (problems), the tokens with their
character spans (encode), the labels cut to ``max_length`` (labels) and what a batch became (outcome).
"""

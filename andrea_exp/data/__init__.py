"""Data: the sources a run trains on (conf/data/*: a Markov chain with an exact entropy floor, a user's text
file, a token corpus), the reference losses measured from the data, and the commands that make corpora.

Owns: sources (the loaders and batches), references (unigram / bigram losses), prepare (text -> token files:
`python -m andrea_exp.prepare`, `andrea-exp-prepare`), corpora (`python -m andrea_exp.corpora`).

May import: config.
"""

"""Contextual encodings: terms that read q or k (relative tables read by the query), value
terms, and changes of the attention weights themselves (Shaw, Transformer-XL, DeBERTa, iRPE,
Cable, URPE, ...)."""

"""hopwise: collectives that stop distributed training from waiting on the network.

The PyTorch backend is ``hopwise.torch``: ``import hopwise.torch`` registers backend ``"hopwise"``.
"""

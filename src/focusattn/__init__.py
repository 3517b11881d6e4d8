"""focusattn: sparse, sink-free attention (Focus routing and Lazy Attention) for PyTorch and Hugging Face models."""
__version__ = "0.1.0"

"""The text modality: token sequences, their models and what their updates leak."""

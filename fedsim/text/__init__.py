"""Text federations: token sequences as a second modality beside images.

Registered on the first lookup of the kernel's registries (a registry names this
package to discover): the ``text`` modality (:mod:`fedsim.text.modality`), the
datasets (:mod:`fedsim.text.data`: LEAF's Shakespeare by speaking role, by
character or by word, and a folder of a researcher's own text files) and the
models (:mod:`fedsim.text.models`: LEAF's character LSTM, a small causal
transformer). What a text update leaks is read by :mod:`fedsim.text.words`; what a
released model memorised, by :mod:`fedsim.text.exposure` (canaries' exposure).
A floor of its own between the kernel and the components: it imports only
:mod:`fedsim.core`.
"""

"""Everything a run writes or shows: its folder, CSVs, verdict, report, figures,
progress lines and TensorBoard. No Ray, no Flower: readers of a finished run
folder (``fedsim report``, ``fedsim compare``) use this alone.
"""

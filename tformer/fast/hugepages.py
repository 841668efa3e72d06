"""Back large CPU tensors with transparent huge pages; imported before torch on purpose.

Training allocates its largest tensors afresh at every step (the logits and their gradient, the
embedding gradient, optimizer temporaries). With 4 KB pages the first touch of each page is a
page fault: about 250,000 per step for the paper's base model on a 2-core CPU, which made a step
up to 40% slower and its time erratic. torch's own switch ``THP_MEM_ALLOC_ENABLE`` aligns
allocations of 2 MB and more to huge pages and asks the kernel for them (Linux, where transparent
huge pages are in "madvise" or "always" mode; elsewhere it does nothing). torch reads it once, at
its first allocation, so it must be set before torch is imported; an explicit setting wins
(``THP_MEM_ALLOC_ENABLE=0`` turns it off).
"""

from __future__ import annotations

import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

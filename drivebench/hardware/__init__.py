"""What this machine's GPUs are and how they are linked, for training and the doctor alike.

:mod:`.nvml`: read-only NVML queries (driver, names, CUDA device -> NVML handle by UUID, links).
:mod:`.p2p`: the NCCL peer-to-peer verdict the doctor measures and ``dist.p2p=auto`` applies.
Both import nothing heavy and leave CUDA alone where NVML answers, so a launcher may use them
before it spawns its workers; the training path needs nothing from :mod:`drivebench.doctor`.
"""

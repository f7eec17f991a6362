"""``python -m lightning_epo.doctor [overrides]``: can this machine run the configuration the overrides select?
One line per component (lightning_epo/doctor/checks.py), a memory estimate (lightning_epo/doctor/memory.py),
exit status 1 when any line fails."""

"""A paired comparison of arms over seeds (``python -m lightning_epo.reports.compare``): the plan and its run
folders (:mod:`.plan`), running them (:mod:`.runner`), the report (:mod:`.report`)."""

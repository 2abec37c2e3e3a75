"""Batch jobs: a corpus of texts in files embedded into one file of vectors, resumably."""

from embedx.jobs.corpus import CorpusJob, command, run

__all__ = ["CorpusJob", "command", "run"]

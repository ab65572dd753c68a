"""The dataset catalogue: importing this package registers every named task (the only
place that registers any). `t2t.data.tasks.get_task` imports it on first use.
"""
from t2t.data.catalog import (bible, bible_successors, choice, corpora, elmo,  # noqa: F401
                              micro, ner, offline, paper)

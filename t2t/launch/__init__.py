"""Cloud TPU jobs: `t2t launch` creates slices through queued resources and runs t2t on them."""

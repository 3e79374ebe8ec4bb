"""Background runs (`ng_train +background=true`) and `ng_runs` to list, follow, stop and delete them."""

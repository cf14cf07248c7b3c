"""drivebench's Hydra configs, shipped inside the package (``pkg://drivebench.conf``): one folder per config
group. Importing it imports ``drivebench``, which registers the resolvers and schemas these files use."""

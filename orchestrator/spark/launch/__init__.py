"""Starting drivers: the launcher, warm spares, the zygote and the class archive."""

"""The etcd backend on real etcd members: one member and a three-member cluster."""

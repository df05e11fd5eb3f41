"""The ZooKeeper backend on a real standalone server and a real three-member ensemble."""

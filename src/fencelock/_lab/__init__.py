"""The fault lab: scenarios x lock configurations on real servers, and its report."""

"""Process plumbing: worker processes with deadlines, user-set deadlines, interrupts."""

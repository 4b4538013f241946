// Placeholder; the full demo page replaces this.

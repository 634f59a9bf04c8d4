"""The Pulumi Automation API around stacks/: bring a provider's shared infrastructure up, preview it, take it down."""

"""Model families on runtime layers."""

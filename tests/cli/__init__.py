"""Tests of the command line's and the API's contracts: commands, exit codes, reports and their outputs, findings, the fuzz campaign, docs that must agree with the code."""

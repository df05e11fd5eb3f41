"""Pure rules, no server: arguments, time, keys, URLs, RESP, the Redlock and fence models, the bench's arithmetic."""

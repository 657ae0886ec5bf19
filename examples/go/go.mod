module example.com/license-check

go 1.19

module example.com/goprof

go 1.19

module github.com/rewind/tools/oracle/extract

go 1.24

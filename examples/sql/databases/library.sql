CREATE TABLE authors (
  id INTEGER PRIMARY KEY,
  name TEXT,
  country TEXT,
  birth_year INTEGER
);
CREATE TABLE books (
  id INTEGER PRIMARY KEY,
  title TEXT,
  author_id INTEGER REFERENCES authors(id),
  genre TEXT,
  year INTEGER,
  pages INTEGER
);
CREATE TABLE members (
  id INTEGER PRIMARY KEY,
  name TEXT,
  city TEXT,
  joined_year INTEGER
);
CREATE TABLE loans (
  id INTEGER PRIMARY KEY,
  book_id INTEGER REFERENCES books(id),
  member_id INTEGER REFERENCES members(id),
  loan_date TEXT,
  return_date TEXT
);
INSERT INTO authors (id, name, country, birth_year) VALUES (1, 'Farid Patel', 'Canada', 1983);
INSERT INTO authors (id, name, country, birth_year) VALUES (2, 'Wei Patel', 'Portugal', 1967);
INSERT INTO authors (id, name, country, birth_year) VALUES (3, 'Umar Larsen', 'Portugal', 1939);
INSERT INTO authors (id, name, country, birth_year) VALUES (4, 'Priya Rossi', 'Portugal', 1935);
INSERT INTO authors (id, name, country, birth_year) VALUES (5, 'Priya Muller', 'Portugal', 1978);
INSERT INTO authors (id, name, country, birth_year) VALUES (6, 'Quinn Kowalski', 'Nigeria', 1990);
INSERT INTO authors (id, name, country, birth_year) VALUES (7, 'Ana Silva', 'Japan', 1971);
INSERT INTO authors (id, name, country, birth_year) VALUES (8, 'Liam Patel', 'France', 1939);
INSERT INTO authors (id, name, country, birth_year) VALUES (9, 'Chloe Garcia', 'Nigeria', 1924);
INSERT INTO authors (id, name, country, birth_year) VALUES (10, 'Zoe Kowalski', 'France', 1950);
INSERT INTO authors (id, name, country, birth_year) VALUES (11, 'Hiro Okafor', 'Portugal', 1945);
INSERT INTO authors (id, name, country, birth_year) VALUES (12, 'Nora Patel', 'Nigeria', 1929);
INSERT INTO authors (id, name, country, birth_year) VALUES (13, 'Tara Smith', 'Portugal', 1980);
INSERT INTO authors (id, name, country, birth_year) VALUES (14, 'Ben Moreau', 'Canada', 1969);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (1, 'The Harbor of Orchard', 13, 'mystery', 1989, 341);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (2, 'The Letters of Harbor', 2, 'poetry', 1958, 268);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (3, 'The Garden of Orchard', 13, 'science', 1997, 253);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (4, 'The Night of Signal', 11, 'novel', 2016, 763);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (5, 'The Machine of Letters', 4, 'science', 1970, 849);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (6, 'The Lantern of Island', 10, 'novel', 1994, 592);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (7, 'The Letters of Orchard', 9, 'science', 1981, 341);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (8, 'The Mirror of Harbor', 3, 'mystery', 1958, 539);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (9, 'The Night of Garden', 13, 'science', 2011, 148);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (10, 'The Machine of Empire', 14, 'history', 1956, 354);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (11, 'The Lantern of Signal', 11, 'history', 1954, 519);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (12, 'The Mirror of Silence', 4, 'poetry', 2000, 161);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (13, 'The Winter of Island', 14, 'history', 1968, 244);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (14, 'The Island of Silence', 12, 'science', 1956, 348);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (15, 'The Empire of Machine', 3, 'mystery', 2011, 118);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (16, 'The Forest of Orchard', 4, 'history', 1969, 467);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (17, 'The Garden of Silence', 10, 'science', 2012, 685);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (18, 'The Silence of Forest', 14, 'science', 1989, 232);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (19, 'The Silence of Orchard', 9, 'mystery', 1985, 232);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (20, 'The Night of Empire', 13, 'novel', 1998, 791);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (21, 'The Empire of Forest', 3, 'novel', 1983, 697);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (22, 'The Mirror of Winter', 6, 'poetry', 2003, 353);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (23, 'The Forest of Island', 11, 'science', 1967, 226);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (24, 'The Orchard of Empire', 3, 'novel', 2000, 186);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (25, 'The Orchard of Winter', 3, 'novel', 2007, 895);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (26, 'The Night of Machine', 3, 'novel', 1965, 761);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (27, 'The Island of Empire', 5, 'poetry', 1988, 641);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (28, 'The Orchard of Letters', 6, 'science', 2013, 314);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (29, 'The River of Forest', 10, 'poetry', 1973, 278);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (30, 'The Winter of Harbor', 14, 'science', 1975, 817);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (31, 'The Orchard of Garden', 12, 'mystery', 1955, 708);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (32, 'The River of Lantern', 12, 'mystery', 1957, 899);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (33, 'The Garden of Empire', 1, 'science', 2009, 155);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (34, 'The Harbor of Lantern', 7, 'mystery', 1972, 818);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (35, 'The Signal of Harbor', 4, 'history', 1990, 853);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (36, 'The Harbor of Forest', 1, 'poetry', 1999, 249);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (37, 'The River of Letters', 5, 'history', 2014, 652);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (38, 'The Letters of Lantern', 8, 'mystery', 1962, 648);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (39, 'The Letters of Forest', 10, 'novel', 2015, 699);
INSERT INTO books (id, title, author_id, genre, year, pages) VALUES (40, 'The Letters of Island', 12, 'history', 2016, 407);
INSERT INTO members (id, name, city, joined_year) VALUES (1, 'Jonas Rossi', 'Lisbon', 2017);
INSERT INTO members (id, name, city, joined_year) VALUES (2, 'Chloe Moreau', 'Lyon', 2017);
INSERT INTO members (id, name, city, joined_year) VALUES (3, 'Grace Ivanova', 'Osaka', 2021);
INSERT INTO members (id, name, city, joined_year) VALUES (4, 'Vera Patel', 'Porto', 2022);
INSERT INTO members (id, name, city, joined_year) VALUES (5, 'David Novak', 'Austin', 2020);
INSERT INTO members (id, name, city, joined_year) VALUES (6, 'Umar Novak', 'Krakow', 2013);
INSERT INTO members (id, name, city, joined_year) VALUES (7, 'Umar Smith', 'Austin', 2024);
INSERT INTO members (id, name, city, joined_year) VALUES (8, 'Quinn Silva', 'Austin', 2016);
INSERT INTO members (id, name, city, joined_year) VALUES (9, 'Vera Smith', 'Krakow', 2019);
INSERT INTO members (id, name, city, joined_year) VALUES (10, 'Priya Chen', 'Dublin', 2023);
INSERT INTO members (id, name, city, joined_year) VALUES (11, 'Maya Novak', 'Lisbon', 2012);
INSERT INTO members (id, name, city, joined_year) VALUES (12, 'Hiro Silva', 'Osaka', 2013);
INSERT INTO members (id, name, city, joined_year) VALUES (13, 'Ben Patel', 'Krakow', 2024);
INSERT INTO members (id, name, city, joined_year) VALUES (14, 'Ben Kowalski', 'Dublin', 2021);
INSERT INTO members (id, name, city, joined_year) VALUES (15, 'Ines Chen', 'Lyon', 2011);
INSERT INTO members (id, name, city, joined_year) VALUES (16, 'Yara Patel', 'Lyon', 2011);
INSERT INTO members (id, name, city, joined_year) VALUES (17, 'Omar Kowalski', 'Krakow', 2019);
INSERT INTO members (id, name, city, joined_year) VALUES (18, 'Maya Chen', 'Dublin', 2021);
INSERT INTO members (id, name, city, joined_year) VALUES (19, 'Kira Dubois', 'Austin', 2011);
INSERT INTO members (id, name, city, joined_year) VALUES (20, 'Hiro Novak', 'Lyon', 2021);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (1, 38, 7, '2023-04-22', '2023-05-09');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (2, 10, 17, '2022-01-11', '2022-01-24');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (3, 25, 6, '2022-10-23', '2022-11-18');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (4, 18, 6, '2023-07-14', '2023-08-08');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (5, 14, 2, '2024-05-04', '2024-05-27');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (6, 33, 19, '2024-12-12', '2024-12-15');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (7, 16, 1, '2023-10-15', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (8, 13, 15, '2024-03-04', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (9, 37, 14, '2023-01-12', '2023-02-15');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (10, 36, 8, '2022-05-07', '2022-05-22');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (11, 2, 19, '2024-10-15', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (12, 13, 5, '2022-02-14', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (13, 35, 20, '2022-08-27', '2022-09-28');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (14, 10, 9, '2023-11-26', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (15, 1, 3, '2022-06-10', '2022-06-15');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (16, 13, 12, '2022-09-04', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (17, 38, 16, '2023-06-02', '2023-06-20');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (18, 7, 8, '2024-11-13', '2024-12-06');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (19, 13, 17, '2024-05-14', '2024-06-11');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (20, 33, 2, '2022-06-27', '2022-07-20');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (21, 12, 1, '2024-09-21', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (22, 29, 1, '2024-06-16', '2024-07-04');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (23, 40, 18, '2024-01-07', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (24, 30, 12, '2024-02-10', '2024-02-11');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (25, 2, 13, '2023-03-20', '2023-03-31');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (26, 14, 8, '2022-09-17', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (27, 24, 3, '2024-09-10', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (28, 35, 12, '2022-07-20', '2022-08-26');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (29, 2, 7, '2022-01-14', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (30, 34, 12, '2024-02-07', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (31, 28, 20, '2024-05-04', '2024-06-03');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (32, 12, 14, '2023-04-21', '2023-05-16');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (33, 35, 15, '2022-08-16', '2022-08-30');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (34, 20, 5, '2022-06-19', '2022-07-04');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (35, 1, 19, '2022-07-05', '2022-07-24');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (36, 36, 16, '2024-08-07', '2024-08-11');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (37, 22, 15, '2022-06-27', '2022-07-20');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (38, 5, 9, '2023-10-21', '2023-10-28');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (39, 30, 4, '2023-11-09', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (40, 5, 10, '2022-10-28', '2022-11-13');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (41, 17, 4, '2024-03-05', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (42, 33, 7, '2024-10-10', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (43, 14, 2, '2022-08-25', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (44, 1, 7, '2024-06-21', '2024-07-01');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (45, 27, 2, '2023-01-09', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (46, 15, 20, '2022-10-21', '2022-11-19');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (47, 24, 14, '2023-09-18', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (48, 10, 12, '2024-01-21', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (49, 33, 19, '2023-08-21', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (50, 30, 8, '2022-08-26', '2022-10-03');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (51, 10, 6, '2024-12-03', '2024-12-04');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (52, 14, 2, '2023-06-23', '2023-07-23');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (53, 11, 5, '2022-04-05', '2022-04-20');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (54, 8, 13, '2024-02-06', '2024-02-14');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (55, 35, 1, '2022-04-23', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (56, 7, 8, '2022-04-08', '2022-04-22');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (57, 34, 1, '2023-10-26', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (58, 23, 14, '2023-05-11', NULL);
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (59, 26, 19, '2022-10-16', '2022-11-16');
INSERT INTO loans (id, book_id, member_id, loan_date, return_date) VALUES (60, 17, 16, '2022-01-21', '2022-02-07');
